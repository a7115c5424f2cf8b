"""When a trial or a study stops early: the pruner of clearly slow trials (`pruning`), and
budgets of time or device-hours and the flat-search rule (`budget`).

It reads the study through storage (and keeps its own study attrs there); it never imports
execution, the search, a study's run or analysis. Modules are imported by name: this file
re-exports nothing.
"""
