"""Data for the experiments: synthetic identifiability data, bouncing balls (generated) and
scikit-learn's bundled 8x8 digits (:mod:`rpm.data.digits`)."""
