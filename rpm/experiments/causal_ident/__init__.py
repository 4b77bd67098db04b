"""``rpm causal-ident``: what augmentations keep, on a procedural Causal3DIdent."""
