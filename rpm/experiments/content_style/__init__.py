"""``rpm content-style``: the content-invariant prior of von Kügelgen et al. (2021) as an RPM."""
