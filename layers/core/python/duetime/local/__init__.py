"""The embedded local stack: moto's server on loopback, the real handlers, a clock loop and worker processes."""
