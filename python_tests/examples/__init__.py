"""examples/ run as users run them."""
