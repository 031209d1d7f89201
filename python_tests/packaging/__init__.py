"""The build and the distribution: pip-installed package, metadata, a build without a CUDA
toolkit, the package's tree and public names."""
