"""Read-only views of studies: DataFrames (`frames`), the ranking and the confirm statistics
(`ranking`), a study as the terminal and the report see it (`view`, `show`, `report`).

Nothing here writes storage, and nothing imports the study's run, the search, execution or the
trial program; a study's run reports through `ranking` (so its final table, the confirm phase
and export rank alike). Modules are imported by name: this file re-exports nothing.
"""
