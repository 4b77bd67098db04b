"""``rpm masks``: sparse transitions of moving masks identify their factors (Zimmermann et al.
2021, Table 3; :mod:`rpm.experiments.masks.command`)."""
