"""README.md and docs/ stay true to the tree and the package."""
