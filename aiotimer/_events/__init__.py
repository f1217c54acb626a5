"""The event records, by family; :mod:`aiotimer.events` is their public face."""
