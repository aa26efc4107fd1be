"""What every layer uses: errors, atomic files and provenance, digests, typed file models, TOML, plug-in
registries, figures, progress messages, limits, locking, natural ordering, JSON-ready values."""
