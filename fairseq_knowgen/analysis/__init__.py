"""Analysis helpers (attention and coverage maps) used by scripts/plot_coverage.py."""
