"""Choosing the next candidate: the samplers (`samplers`), the cost model as a prior (`prior`;
whether a study gets one, `study_prior`), and the proposer that asks, de-duplicates and screens
for feasibility (`proposer`).

It may ask and enqueue trials; it never tells an outcome, and never imports execution, a
study's run or Ray. Modules are imported by name: this file re-exports nothing.
"""
