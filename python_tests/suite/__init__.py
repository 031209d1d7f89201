"""The test suite itself: its layout rules (no test file imports another) and scripts/test.sh's pytest step."""
