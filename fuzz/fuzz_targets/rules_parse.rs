//! The rule parser and compiler, in all three formats, then an evaluation: never panics.
#![no_main]

use gray_rules::{Format, RequestView, RuleSet};
use http::{HeaderMap, HeaderValue, Uri};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let format = match which % 3 {
        0 => Format::Json,
        1 => Format::Toml,
        _ => Format::Yaml,
    };
    match RuleSet::parse(text, format, "fuzz") {
        Ok(rules) => {
            let uri = Uri::from_static("/v1/users?uid=7&v=2");
            let mut headers = HeaderMap::new();
            headers.insert("x-user-id", HeaderValue::from_static("user-1"));
            headers.insert("cookie", HeaderValue::from_static("beta=1; uid=9"));
            let view = RequestView::new(&uri, &headers).with_client_ip(Some([10, 1, 2, 3].into()));
            let decided = rules.evaluate(&view).map(|d| d.rule().index());
            assert!(decided.is_none_or(|i| i < rules.rules().len()));
            let explained = rules.explain(&view);
            assert!(explained.checked.len() <= rules.rules().len());
        }
        Err(e) => assert!(e.to_string().starts_with("fuzz:")),
    }
});
