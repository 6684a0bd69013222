"""Views over the folded state: the context the model is given at a point."""
