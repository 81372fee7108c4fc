"""Wire keys: the names of records and config entries that travel between ServerApp and ClientApp.

One place for every key, so the server and client halves cannot drift apart.
"""

ARRAYS = "arrays"  # the model's ArrayRecord (Flower's default key, kept so Flower strategies work)
CONFIG = "config"  # the per-round ConfigRecord (Flower's default key)
METRICS = "metrics"  # the reply's MetricRecord

# ConfigRecord entries
SERVER_ROUND = "server-round"  # set by Flower's strategies too
RUN_CONFIG = "fedsim-config"  # the resolved RunConfig as JSON: clients need no files of their own

# MetricRecord entries
NUM_EXAMPLES = "num-examples"  # Flower's default weighting key
PARTITION_ID = "partition-id"  # also the node_config key Flower's simulation and SuperNodes use
TRAIN_LOSS = "train-loss"
CORRECT = "correct"
EVAL_LOSS = "eval-loss"

# Message types
QUERY_PARTITION = "query.partition"  # asks a node which partition it holds
