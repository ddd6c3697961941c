"""Private module names that neural-tangents 0.6.5's test files import (conformance shim only)."""
