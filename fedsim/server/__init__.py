"""fedsim's server side: the Flower ServerApp (:mod:`.app`) and the round loop it runs (:mod:`.loop`),
with who trains and when to evaluate (:mod:`.sampling`), the reply checks (:mod:`.replies`), the
partition discovery (:mod:`.discovery`), what a strategy is given and asked (:mod:`.strategy`), its
hooks' results checked (:mod:`.contract`), fast averaging (:mod:`.aggregation`), reporting
(:mod:`.reporter`) and checkpoints (:mod:`.checkpoint`).
Nothing here imports :mod:`fedsim.client`.
"""
