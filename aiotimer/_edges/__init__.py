"""The shell's shared edges, written once: the clock, the safe file opener, ``/proc``
reading, process limits, the event log and logging. Used by the server, the supervisor
and the client (which loads only what it needs: ``procfs`` and ``files``)."""
