//! The images a containerd node runs, built locally by `cargo xtask test` (or `cargo
//! xtask node-images`) and handed to the tests as OCI archives, since no registry is
//! reachable: the pod sandbox's `pause`, the CUDA probe's image and Tessera's own image
//! (what `cargo xtask image` builds). Each node imports them into its containerd
//! (`ctr images import`); the kubelet never pulls.

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// The file listing the images next to their archives.
pub const MANIFEST: &str = "images.json";

/// Image references, and where their archives are.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeImages {
    /// The pod sandbox image (containerd's `pinned_images.sandbox`).
    pub pause: String,
    /// `tessera-probe` on a distroless-like base, with `/pause` to hold a pod.
    pub probe: String,
    /// Tessera's image (operator, plugin, CDI hook).
    pub tessera: String,
    /// The directory holding `<name>.tar` for each (not serialized: where it was read).
    #[serde(skip)]
    pub dir: PathBuf,
}

/// Where the probe image keeps the binary.
pub const PROBE_IN_IMAGE: &str = "/usr/local/bin/tessera-probe";
/// Where the probe image keeps `pause`, to hold a pod whose probe ran in an init container.
pub const PAUSE_IN_IMAGE: &str = "/pause";

impl NodeImages {
    /// The images `cargo xtask test` built: `$TESSERA_NODE_IMAGES`, else `node-images/`
    /// in the target directory of the running test binary.
    pub fn for_tests() -> anyhow::Result<Self> {
        let dir = match std::env::var_os("TESSERA_NODE_IMAGES") {
            Some(d) => PathBuf::from(d),
            None => {
                let exe = std::env::current_exe()?;
                // target/<profile>/deps/<test> or target/<profile>/<binary>
                exe.ancestors()
                    .skip(1)
                    .take(3)
                    .map(|d| d.join("node-images"))
                    .find(|d| d.join(MANIFEST).is_file())
                    .context(
                        "the containerd nodes' images are not built: run `cargo xtask node-images` (cargo xtask test does), or set TESSERA_NODE_IMAGES",
                    )?
            }
        };
        Self::read(&dir)
    }

    /// The images listed in `dir`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let path = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut images: Self =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        images.dir = dir.to_path_buf();
        for (name, _) in images.all() {
            let archive = images.archive(name);
            anyhow::ensure!(
                archive.is_file(),
                "{} is missing: rebuild with `cargo xtask node-images`",
                archive.display()
            );
        }
        Ok(images)
    }

    /// (name, reference) of every image.
    pub fn all(&self) -> [(&'static str, &str); 3] {
        [
            ("pause", &self.pause),
            ("probe", &self.probe),
            ("tessera", &self.tessera),
        ]
    }

    /// The OCI archive of image `name`.
    pub fn archive(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.tar"))
    }

    /// Tessera's image as the chart's `image.repository` and `image.tag`.
    pub fn tessera_repository_and_tag(&self) -> (&str, &str) {
        self.tessera
            .rsplit_once(':')
            .unwrap_or((self.tessera.as_str(), "latest"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_must_name_an_archive_for_every_image() {
        let dir = tempfile::tempdir().unwrap();
        let images = NodeImages {
            pause: "localhost/tessera-pause:1".into(),
            probe: "localhost/tessera-probe:1".into(),
            tessera: "localhost/tessera:0.1.0-tb1".into(),
            dir: PathBuf::new(),
        };
        std::fs::write(
            dir.path().join(MANIFEST),
            serde_json::to_string(&images).unwrap(),
        )
        .unwrap();
        let err = NodeImages::read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("pause.tar is missing"), "{err}");
        for name in ["pause", "probe", "tessera"] {
            std::fs::write(dir.path().join(format!("{name}.tar")), b"").unwrap();
        }
        let read = NodeImages::read(dir.path()).unwrap();
        assert_eq!(
            read.tessera_repository_and_tag(),
            ("localhost/tessera", "0.1.0-tb1")
        );
    }
}
