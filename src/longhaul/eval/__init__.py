"""Evaluation: pass rates with intervals, paired comparisons, HTML reports."""
