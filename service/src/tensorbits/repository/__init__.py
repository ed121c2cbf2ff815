"""The model repository: the folder on disk, the store shared by workers, polling."""
