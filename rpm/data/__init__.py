"""Data for the experiments: synthetic identifiability data, bouncing balls and linear
dynamical systems (:mod:`rpm.data.lds`), all generated, and scikit-learn's bundled 8x8 digits
(:mod:`rpm.data.digits`)."""
