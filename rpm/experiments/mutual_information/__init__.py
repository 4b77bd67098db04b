"""``python -m rpm mutual-information``: Poole et al.'s MI staircase (:mod:`.command`)."""
