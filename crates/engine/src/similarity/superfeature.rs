//! Super-features per chunk (Finesse / Odess; Neptune §II-A).
//! (Owned by the similarity work: implementation pending.)

use serde::{Deserialize, Serialize};

/// How the per-chunk features are sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuperFeatureMethod {
    /// Finesse: split the chunk into sub-blocks, take each one's max rolling hash, group by rank.
    Finesse,
    /// Odess: content-defined sampling of the Gear hash, max of linear transforms.
    Odess,
}

/// How super-features are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuperFeatureConfig {
    /// The sampling method.
    pub method: SuperFeatureMethod,
    /// Features per chunk (e.g. 12).
    pub features: usize,
    /// Features grouped into one super-feature (e.g. 4, giving 3 super-features).
    pub per_super_feature: usize,
}

impl Default for SuperFeatureConfig {
    fn default() -> Self {
        SuperFeatureConfig {
            method: SuperFeatureMethod::Odess,
            features: 12,
            per_super_feature: 4,
        }
    }
}

impl SuperFeatureConfig {
    /// The super-features of `chunk`: `features / per_super_feature` values.
    pub fn super_features(&self, chunk: &[u8]) -> Vec<u64> {
        let _ = chunk;
        todo!()
    }
}
