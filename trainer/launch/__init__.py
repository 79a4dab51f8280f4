"""Launch specs (pure functions of one job description) and the backends that run them."""
