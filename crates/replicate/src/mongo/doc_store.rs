//! The sender's source store on MongoDB: current documents by (namespace, `_id`).

use mongodb::bson::{doc, Document};
use mongodb::sync::Client;

use super::{command_err, connect, doc_text, parse_id, split_ns, MongoError};
use crate::sdedup::{FetchFailures, SourceStore};

/// A source server's documents, read by (`db.collection`, `_id` text): the sender's
/// [`SourceStore`] for [`crate::mongo::MongoSource`], with its own client.
///
/// It reads the *current* document, which may be newer than the change being encoded; the
/// content hash in each delta makes a receiver that holds another version ask for the entry
/// raw, so this costs bytes, never correctness. Errors count as "not found" (the entry is then
/// sent whole) and are kept for the report.
pub struct MongoDocStore {
    client: Client,
    failures: FetchFailures,
}

impl std::fmt::Debug for MongoDocStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoDocStore")
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

impl MongoDocStore {
    /// A store reading from the server at `url` (as for [`crate::mongo::MongoSource::connect`]).
    pub fn connect(url: &str) -> Result<Self, MongoError> {
        let (client, _) = connect(url)?;
        Ok(MongoDocStore {
            client,
            failures: FetchFailures::default(),
        })
    }

    fn try_fetch(&self, collection: &str, id: &str) -> Result<Option<Vec<u8>>, MongoError> {
        let (Some((db, coll)), Ok(id)) = (split_ns(collection), parse_id(id)) else {
            return Ok(None);
        };
        let doc = self
            .client
            .database(db)
            .collection::<Document>(coll)
            .find_one(doc! {"_id": id})
            .run()
            .map_err(command_err(format!("reading {collection}")))?;
        Ok(doc.as_ref().map(doc_text))
    }
}

impl SourceStore for MongoDocStore {
    fn failures(&self) -> (u64, Option<&str>) {
        self.failures.get()
    }

    fn fetch(&mut self, collection: &str, id: &str) -> Option<Vec<u8>> {
        match self.try_fetch(collection, id) {
            Ok(doc) => doc,
            Err(e) => {
                self.failures.record(e);
                None
            }
        }
    }
}
