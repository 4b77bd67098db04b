"""``rpm bouncing-balls``: which prior recovers the positions of bouncing balls (Section 5 and
Appendix D of Aitchison & Ganev). :mod:`.command` runs it, :mod:`.evaluate` scores an encoder
by a linear read-out of the ball positions, :mod:`.plots` draws the figures."""
