"""Where studies live and what a trial looks like there: opening storages (`opening`), the
trial-attribute schema (`schema`) and the counting rules (`counting`), driver identity,
heartbeats and locks (`drivers`), and recovering what a dead driver left (`recovery`).

It stores what it is given (a diagnosis, a timing) and computes none of it: it never imports
the cost model, the search, execution, a study's run, analysis or Ray. Modules are imported by
name: this file re-exports nothing.
"""
