"""Offline thermal tools: record traces, fit the RC model, simulate and tune window policies, measure the
quality table. Nothing the live controller needs at run time lives here."""
