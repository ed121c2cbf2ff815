"""The process: command line, workers, the HTTP and gRPC servers started side by side."""
