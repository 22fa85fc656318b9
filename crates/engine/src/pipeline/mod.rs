//! pipeline (pending)
