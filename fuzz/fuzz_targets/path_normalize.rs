//! Request path normalisation: never panics; normalising twice changes nothing; a normal
//! path starts with `/`, holds no `//`, `/./` or `/../` (so it never climbs above the root)
//! and `is_normal` says so; a path under `/svc/` without a dot or an escape stays under it;
//! the URI form keeps the query and agrees with the path form.
#![no_main]

use gray_rules::path::{is_normal, normalize, normalize_uri};
use http::Uri;
use libfuzzer_sys::fuzz_target;

fn check_normal(normal: &str) {
    assert!(normal.starts_with('/'), "{normal:?}");
    assert!(!normal.contains("//"), "{normal:?}");
    assert!(!normal.contains("/./") && !normal.ends_with("/."), "{normal:?}");
    assert!(!normal.contains("/../") && !normal.ends_with("/.."), "{normal:?}");
    assert!(is_normal(normal), "{normal:?}");
    assert_eq!(normalize(normal).as_deref(), Ok(normal), "not idempotent");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // As given, and as an absolute path.
    for path in [text.to_owned(), format!("/{text}")] {
        match normalize(&path) {
            Ok(normal) => {
                check_normal(&normal);
                assert_eq!(is_normal(&path), normal == path);
            }
            Err(_) => assert!(!is_normal(&path)),
        }
    }
    // Under a service prefix: without a `.` or a `%`, nothing can climb out of it.
    let under = format!("/svc/{text}");
    if let Ok(normal) = normalize(&under) {
        if !text.contains('.') && !text.contains('%') {
            assert!(normal.starts_with("/svc/") || normal == "/svc", "{under:?} -> {normal:?}");
        }
    }
    // The URI form: the same path, the query untouched.
    if let Ok(uri) = Uri::try_from(format!("/{text}")) {
        match (normalize_uri(&uri), normalize(uri.path())) {
            (Ok(Some(normal)), Ok(path)) => {
                assert_eq!(normal.path(), path);
                assert_eq!(normal.query(), uri.query());
            }
            (Ok(None), Ok(path)) => assert_eq!(path, uri.path()),
            (Err(a), Err(b)) => assert_eq!(a, b),
            (a, b) => panic!("uri {a:?} and path {b:?} disagree"),
        }
    }
});
