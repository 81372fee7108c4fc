"""The schemas of a run directory's JSON files (fedsim/record/schemas.py), as strictly as fedsim writes them: numbers
never text or booleans, accuracies in [0, 1], rounds on the run and its cadence, manifests of the layout's files.
How a reader names a line that breaks them: tests/test_reader.py and tests/test_reading.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from fedsim.cadence import EvalCadence
from fedsim.record.layout import RECORD_VERSION
from fedsim.record.schemas import Progress, RoundRecord, Summary

LINE = {"round": 4, "time_s": 1.5, "train_loss": 0.7, "client_mean_acc": 0.5, "client_acc": [0.4, None, 0.6]}
SHA = "0" * 64


def test_a_metrics_line_as_fedsim_writes_it_is_kept_whole() -> None:
    line = {**LINE, "per_class_acc": [0.1, 0.2], "failed_clients": {"3": [1, 2]}, "personal_acc": 0.9}
    assert RoundRecord.model_validate(line).model_dump(exclude_unset=True) == line  # other metrics kept as written


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"client_mean_acc": 1.2}, "client_mean_acc"),
        ({"personal_acc": -0.1}, "personal_acc"),
        ({"client_acc": [0.5, "0.6"]}, "client_acc"),
        ({"train_loss": "0.7"}, "train_loss"),  # an extra metric that is text
        ({"train_loss": True}, "train_loss"),  # or a boolean
        ({"round": 0}, "round"),
        ({"round": "4"}, "round"),
        ({"time_s": -1.0}, "time_s"),
    ],
)
def test_a_line_fedsim_could_not_have_written_is_refused_naming_the_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        RoundRecord.model_validate({**LINE, **change})
    assert err.value.errors()[0]["loc"][0] == field


def test_a_round_beyond_the_run_or_off_its_cadence_is_not_the_runs() -> None:
    context = {"last": 10, "cadence": EvalCadence(2, 10)}
    RoundRecord.model_validate(LINE, context=context)
    with pytest.raises(ValidationError, match="round 12 is beyond the run's 10 rounds"):
        RoundRecord.model_validate({**LINE, "round": 12}, context=context)
    with pytest.raises(ValidationError, match=r"round 3 is not one the run evaluated \(eval\.every: 2, and its last"):
        RoundRecord.model_validate({**LINE, "round": 3}, context=context)


def test_a_current_progress_and_summary_carry_their_manifest() -> None:
    files = {"metrics.jsonl": {"size": 10, "sha256": SHA}}
    Progress.model_validate({"round": 3, "loss": 0.5, "acc": None, "record_version": RECORD_VERSION, "files": files})
    with pytest.raises(ValidationError, match="files: Field required"):
        Progress.model_validate({"round": 3, "loss": 0.5, "acc": None, "record_version": RECORD_VERSION})
    with pytest.raises(ValidationError, match="notes.txt is not a file a manifest lists"):
        Progress.model_validate({"round": 3, "loss": 0.5, "acc": None, "record_version": RECORD_VERSION,
                                 "files": {**files, "notes.txt": {"size": 1, "sha256": SHA}}})  # fmt: skip
    with pytest.raises(ValidationError, match="sha256"):
        Progress.model_validate({"round": 3, "loss": 0.5, "acc": None, "record_version": RECORD_VERSION,
                                 "files": {"metrics.jsonl": {"size": 10, "sha256": "not hex"}}})  # fmt: skip


def test_a_summary_with_personalised_accuracy_in_range() -> None:
    summary = {"rounds": 5, "final_client_mean_acc": 0.5, "best_client_mean_acc": 0.6, "final_global_acc": None}
    assert Summary.model_validate({**summary, "final_personal_acc": 0.9}).final_personal_acc == 0.9
    with pytest.raises(ValidationError, match="best_personal_acc"):
        Summary.model_validate({**summary, "best_personal_acc": 1.5})
