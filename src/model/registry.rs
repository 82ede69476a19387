//! Loading a model: architecture detection picks the module that builds it.

/// Options for loading a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Longest sequence a session may hold; 0 = the model's own maximum.
    pub max_context: usize,
}
