//! The operator's Kafka clients, one set per cluster and client configuration, shared by
//! the apps that use it and dropped when the last of them goes away or moves to other
//! credentials: a rotated password or a deleted app leaves no client (with its
//! connections and credentials) behind.
//!
//! Pure bookkeeping: it never creates a connection itself (the caller's `make` does)
//! and knows nothing of Kafka.

use std::collections::HashMap;

/// Clients by configuration key, and the key each app uses.
#[derive(Debug)]
pub struct ClientCache<T> {
    clients: HashMap<String, T>,
    users: HashMap<String, String>,
}

impl<T> Default for ClientCache<T> {
    fn default() -> Self {
        Self {
            clients: HashMap::new(),
            users: HashMap::new(),
        }
    }
}

impl<T: Clone> ClientCache<T> {
    /// The client for `key`, which `app` uses from now on (made with `make` when there
    /// is none). The client of the key the app used before is dropped if no app uses it.
    pub fn get<E>(
        &mut self,
        app: &str,
        key: &str,
        make: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let c = match self.clients.get(key) {
            Some(c) => c.clone(),
            None => {
                let c = make()?;
                self.clients.insert(key.to_string(), c.clone());
                c
            }
        };
        if let Some(old) = self.users.insert(app.to_string(), key.to_string())
            && old != key
        {
            self.drop_unused(&old);
        }
        Ok(c)
    }

    /// `app` is gone: its client goes too unless another app uses it.
    pub fn forget(&mut self, app: &str) {
        if let Some(old) = self.users.remove(app) {
            self.drop_unused(&old);
        }
    }

    fn drop_unused(&mut self, key: &str) {
        if !self.users.values().any(|k| k == key) {
            self.clients.remove(key);
        }
    }

    pub fn len(&self) -> usize {
        self.clients.len()
    }

    pub fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(cache: &mut ClientCache<u32>, app: &str, key: &str, n: u32) -> u32 {
        cache.get(app, key, || Ok::<_, ()>(n)).expect("made")
    }

    #[test]
    fn apps_on_one_cluster_share_its_client() {
        let mut c = ClientCache::default();
        assert_eq!(made(&mut c, "a/x", "k1", 1), 1);
        assert_eq!(made(&mut c, "b/y", "k1", 2), 1, "reused, not made again");
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn rotated_credentials_drop_the_old_client_once_nobody_uses_it() {
        let mut c = ClientCache::default();
        made(&mut c, "a/x", "k1", 1);
        made(&mut c, "b/y", "k1", 1);
        made(&mut c, "a/x", "k2", 2);
        assert_eq!(c.len(), 2, "b/y still uses k1");
        made(&mut c, "b/y", "k2", 3);
        assert_eq!(c.len(), 1, "k1 is dropped with its last user");
    }

    #[test]
    fn a_deleted_apps_client_goes_with_it() {
        let mut c = ClientCache::default();
        made(&mut c, "a/x", "k1", 1);
        c.forget("a/x");
        assert!(c.is_empty());
        c.forget("never/seen");
        assert!(c.is_empty());
    }
}
