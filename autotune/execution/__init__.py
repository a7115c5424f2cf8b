"""Running a job and telling how it ended: the executors of every backend (`executors`: the
estimate, a replay table, the real program through Ray), the replay tables (`replay`), Ray
dispatch (`dispatch`; the cluster it runs on, `ray_cluster`; what it runs in Ray's workers,
`ray_tasks`) and the nodes a trial spans (`nodes`), one trial's subprocess (`runner`) launched
as its trial program's run side says (`program_run`; MindFormers' in `mindformers_run`), trials
in workers that stay up (`warm`), reading how it ended (`classify`) and owning its process tree
(`processes`).

It never decides what to try next and never touches the study: no Optuna, no storage, no
search, no study run, no analysis. It speaks `autotune.jobs` with the search side. Modules are
imported by name: this file re-exports nothing.
"""
