"""A run directory: what it holds (:mod:`~fedsim.record.layout`), who owns it while a run writes it
(:mod:`~fedsim.record.claim`), where runs are (:mod:`~fedsim.record.paths`), how a run writes it
(:mod:`~fedsim.record.writer`, :mod:`~fedsim.record.checkpoint`), the checksums it records
(:mod:`~fedsim.record.checksums`), its files read back (:mod:`~fedsim.record.schemas`,
:mod:`~fedsim.record.reader`), checked (:mod:`~fedsim.record.verify`) and read whole
(:mod:`~fedsim.record.run`); an older fedsim's record brought to this version (:mod:`~fedsim.record.upgrade`)."""
