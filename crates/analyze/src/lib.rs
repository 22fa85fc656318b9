//! analyze (pending)
