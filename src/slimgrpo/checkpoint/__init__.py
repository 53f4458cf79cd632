"""The run folder and what is saved in it: the folder's lock and plan (run_folder, run_lock), one process's
checkpoint format (format) and the sharded one (sharded), atomic writes (storage), and the Checkpointer
(manager) over a run's stateful parts."""
