//! Arbitrary bytes as a backup's files cache: decoding ends in a cache or a clear error, never
//! a panic; a cache that decodes encodes back to the same bytes and answers every lookup.
#![no_main]

use dedupwire_repo::files_cache::FilesCache;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cache) = FilesCache::decode(data) {
        assert_eq!(cache.encode(), data);
        assert_eq!(FilesCache::decode(&cache.encode()), Ok(cache));
    }
});
