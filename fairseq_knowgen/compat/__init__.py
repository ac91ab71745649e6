"""Patches of fairseq 0.12's own behaviour, each in one module; ``docs/fairseq_notes.md`` has their table
(patch | what fairseq does wrong | the test that shows it).

- :mod:`.deferred_registration`: registers the package with fairseq once torch is imported, so that the text
  tools that never import torch start fast;
- :mod:`.checkpoint_compat`: torch's weights-only loader reads fairseq checkpoints; an unreadable one stops
  with ``error: PATH: ...`` (exit 2);
- :mod:`.exact_resume`: a resumed run trains on the batches of an uninterrupted one;
- :mod:`.clean_exit`: no abort at exit from fairseq's prefetch thread;
- :mod:`.interactive_input`: fairseq-interactive refuses a bad input line and decodes the others;
- :mod:`.ngram_block`: ``--no-repeat-ngram-size`` blocks on CPU too;
- :mod:`.self_synced_criterion`: a criterion whose parameters train with their own optimizer (CoCon's
  discriminator) is not wrapped in fairseq's DDP.

The package's ``__init__`` imports the first four when it registers; the tasks use the next two, the ``cocon``
criterion the last. Nothing is
imported here: :mod:`.deferred_registration` must be importable without torch.
"""
