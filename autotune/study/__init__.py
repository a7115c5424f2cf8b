"""One run of a study: open or resume it (`opening`), warm-start it (`warmstart`), the loop
(`loop`, `run`), recording results (`recorder`), the retry policy (`retry`), the confirm phase
(`confirm`), a bulk grid (`bulkgrid`) and the live progress (`progress`).

The only package that brings search, stopping, execution and storage together. Modules are
imported by name: this file re-exports nothing.
"""
