"""The console's run summary (fedsim.server.console.summary_table): the numbers a researcher reads, not the values the
record keeps for fedsim to check its files against."""

from __future__ import annotations

from rich.console import Console

from fedsim.record.layout import RECORD_VERSION, VERSION_KEY
from fedsim.record.manifest import DATA_FINGERPRINT, FILES, SUMMARY_CHECKSUM
from fedsim.server.console import summary_table


def test_the_summary_table_shows_the_numbers_and_none_of_the_checks() -> None:
    checks = {key: "ab" * 32 for key in (SUMMARY_CHECKSUM, DATA_FINGERPRINT)} | {VERSION_KEY: RECORD_VERSION}
    checks[FILES] = {"config.yaml": {"size": 12, "sha256": "ab" * 32}}
    console = Console(width=200, record=True)
    console.print(summary_table({"rounds": 7, "final_client_mean_acc": 0.51234, **checks}))
    shown = console.export_text()
    assert "rounds" in shown and "0.5123" in shown and "final_client_mean_acc" in shown
    assert not [key for key in checks if key in shown] and "abab" not in shown
