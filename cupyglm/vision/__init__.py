"""Images: the processor (image bytes -> pixel rows and patch grid) and the vision tower (its NumPy reference)."""
