"""``python -m rpm uncertainty``: MC-InfoNCE learns each input's posterior width, on Kirchhof et
al.'s controlled process and on corrupted digits (:mod:`rpm.experiments.uncertainty.command`)."""
