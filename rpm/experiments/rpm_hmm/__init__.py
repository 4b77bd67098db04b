"""``rpm rpm-hmm``: the RPM with a hidden Markov chain of discrete latents (Walker et al., 2023)
on a chain of scikit-learn's digits whose classes follow a Markov chain
(:mod:`rpm.experiments.rpm_hmm.command`)."""
