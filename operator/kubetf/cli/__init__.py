"""The command line (`kubetf`, also `kubectl tf`): offline validation, rendering and conversion, the job commands
(submit, status, logs, delete), `kubetf local`, and `kubetf operator`, which starts kubetf.runtime."""
