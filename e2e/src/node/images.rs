//! Image name → local binary mapping.
//!
//! There are no image pulls: an image reference names a binary built on this machine.
//! A container's `command[0]` names the image's entrypoint, so it is replaced by the
//! mapped binary; `command[1..]` and `args` follow it as on a real runtime.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
pub struct ImageMap {
    pub images: Vec<ImageEntry>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ImageEntry {
    /// `name:tag`, where a trailing `*` matches anything (e.g. `oxbow-worker:*`).
    pub image: String,
    pub binary: PathBuf,
}

impl ImageMap {
    pub fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("failed to read {}: {e}", path.display()))?;
        serde_yaml::from_str(&text).map_err(|e| format!("failed to parse {}: {e}", path.display()))
    }

    /// The binary for `image`; a registry prefix (`ghcr.io/oxbow/`) is ignored so the
    /// same manifests work here and on a real cluster.
    pub fn resolve(&self, image: &str) -> Option<&PathBuf> {
        let short = image.rsplit('/').next().unwrap_or(image);
        let short = if short.contains(':') || short.contains('@') {
            short.to_string()
        } else {
            format!("{short}:latest")
        };
        self.images.iter().find_map(|e| {
            let hit = match e.image.strip_suffix('*') {
                Some(prefix) => short.starts_with(prefix),
                None => short == e.image,
            };
            hit.then_some(&e.binary)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_patterns_match_tags_and_ignore_registries() {
        let map: ImageMap = serde_yaml::from_str(
            "images:\n- {image: 'oxbow-worker:*', binary: /bin/w}\n- {image: 'pinned:1', binary: /bin/p}\n",
        )
        .expect("valid yaml");
        assert_eq!(
            map.resolve("oxbow-worker:0.1.0"),
            Some(&PathBuf::from("/bin/w"))
        );
        assert_eq!(
            map.resolve("ghcr.io/oxbow/oxbow-worker:dev"),
            Some(&PathBuf::from("/bin/w"))
        );
        assert_eq!(map.resolve("oxbow-worker"), Some(&PathBuf::from("/bin/w")));
        assert_eq!(map.resolve("pinned:1"), Some(&PathBuf::from("/bin/p")));
        assert_eq!(map.resolve("pinned:2"), None);
        assert_eq!(map.resolve("nginx:1.27"), None);
    }
}
