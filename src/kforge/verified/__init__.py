"""What has really been built: the records of real runs (``docs/verified/records.toml``, :mod:`.records`), joined
with every target forge.toml declares into the matrix of docs/verified.md (:mod:`.matrix`, written by :mod:`.render`;
``kforge matrix``)."""
