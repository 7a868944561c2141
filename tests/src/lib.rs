//! Helpers shared by the integration tests: building C fixtures and running them under the runtime.
