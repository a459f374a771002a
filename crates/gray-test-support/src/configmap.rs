//! A directory laid out the way the kubelet mounts a Kubernetes ConfigMap (Unix only).
//!
//! The kubelet's atomic writer keeps each version of the files in a timestamped directory
//! (`..2026_12_01_10_00_00.000000001`), points the symlink `..data` at the current one, and
//! makes each file a symlink through it (`rules.toml -> ..data/rules.toml`). An update
//! writes a new timestamped directory, makes a symlink `..data_tmp` to it, renames that
//! over `..data` (the one atomic step), then removes the old directory. A reader that
//! opens `rules.toml` sees the old version or the new one, never a mix; one that kept the
//! old file or directory open, or watched its inode, sees a file that no longer changes.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    time::SystemTime,
};

use crate::TempDir;

/// A mounted ConfigMap in a temporary directory; see the [module docs](self).
#[derive(Debug)]
pub struct ConfigMap {
    dir: TempDir,
    version: usize,
    current: Option<String>,
}

impl ConfigMap {
    /// Mounts the first version: `files`, each `(name, content)`.
    pub fn mount(tag: &str, files: &[(&str, &str)]) -> ConfigMap {
        let mut map = ConfigMap {
            dir: TempDir::new(tag),
            version: 0,
            current: None,
        };
        map.update(files);
        for (name, _) in files {
            symlink(Path::new("..data").join(name), map.path(name))
                .unwrap_or_else(|e| panic!("link {name} through ..data: {e}"));
        }
        map
    }

    /// The mounted path of `name` (a symlink through `..data`), as a pod reads it.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Publishes a new version of the files, as the kubelet does: a new timestamped
    /// directory, `..data` swapped to it by renaming a new symlink over it, the old
    /// directory removed.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        self.update_with_mtime(files, None);
    }

    /// [`ConfigMap::update`], each new file's modification time set to `mtime` when given
    /// (to make a new version that only its inode tells from the old one).
    pub fn update_with_mtime(&mut self, files: &[(&str, &str)], mtime: Option<SystemTime>) {
        self.version += 1;
        let name = format!("..2026_12_01_10_00_00.{:09}", self.version);
        let version = self.dir.path().join(&name);
        fs::create_dir(&version).unwrap_or_else(|e| panic!("create {}: {e}", version.display()));
        for (file, content) in files {
            let path = version.join(file);
            fs::write(&path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
            if let Some(mtime) = mtime {
                fs::File::options()
                    .write(true)
                    .open(&path)
                    .and_then(|f| f.set_modified(mtime))
                    .unwrap_or_else(|e| panic!("set the mtime of {}: {e}", path.display()));
            }
        }
        let tmp = self.dir.path().join("..data_tmp");
        symlink(&name, &tmp).unwrap_or_else(|e| panic!("link ..data_tmp: {e}"));
        fs::rename(&tmp, self.dir.path().join("..data"))
            .unwrap_or_else(|e| panic!("rename ..data_tmp over ..data: {e}"));
        if let Some(old) = self.current.replace(name) {
            let old = self.dir.path().join(old);
            fs::remove_dir_all(&old).unwrap_or_else(|e| panic!("remove {}: {e}", old.display()));
        }
    }
}
