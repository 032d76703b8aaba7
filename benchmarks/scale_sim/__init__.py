"""The scale simulator: the project's own code over 10^6-10^7 simulated objects."""
