"""Shared adapter bases: one adapter module stays 40-150 lines on top of these."""
