//! Weighted splits: a fresh random choice per request, or a sticky choice per user by
//! weighted rendezvous hashing of a key ([`sticky_split_arm`]).

use gray_core::{Names, Stain};

use super::{
    condition::{Key, compile_key, non_empty},
    config::{SplitArmConfig, SplitConfig},
    error::{At, RulesError},
    fixed_stain,
    hash::{Dice, sticky_split_arm},
    request::RequestView,
};

/// A compiled split.
#[derive(Debug, Clone)]
pub(crate) enum Split {
    /// Each arm with the cumulative upper bound of its weight, and the total.
    Random { arms: Vec<(u32, Stain)>, total: u32 },
    /// Arms of weight above 0 only (the others never win), in the written order.
    Sticky {
        key: Key,
        salt: Box<[u8]>,
        arms: Vec<StickyArm>,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct StickyArm {
    /// The arm's name, else its position in the written list, in decimal.
    id: Box<[u8]>,
    weight: u32,
    stain: Stain,
}

// === impl Split ===

impl Split {
    /// The stain of the arm `req` falls in; `None` for a sticky split when the request has
    /// no key (the rule does not match).
    pub(crate) fn pick(&self, req: &RequestView<'_>, dice: &mut Option<Dice>) -> Option<Stain> {
        match self {
            Split::Random { arms, total } => {
                let roll = dice.get_or_insert_with(Dice::from_thread).roll(*total);
                arms.iter()
                    .find(|(upper, _)| roll < *upper)
                    .map(|(_, stain)| stain.clone())
            }
            Split::Sticky { key, salt, arms } => {
                let ids = |key: &[u8]| {
                    sticky_split_arm(salt, key, arms.iter().map(|a| (&*a.id, a.weight)))
                };
                let arm = key.with_bytes(req, ids)??;
                arms.get(arm).map(|a| a.stain.clone())
            }
        }
    }
}

/// Compiles the `split` of a rule (not empty).
pub(crate) fn compile(
    at: &At<'_>,
    split: &SplitConfig,
    names: &mut Names,
) -> Result<Split, RulesError> {
    let Some(by) = &split.by else {
        if !split.salt.is_empty() {
            return Err(at.expected(
                "split.by",
                "a key (`header`, `cookie`, `query` or `client_ip`): a salt only mixes into a sticky split's hash",
                Some("none".into()),
            ));
        }
        return random(at, &split.arms, names);
    };
    let key = compile_key(at, "split.by", by)?;
    if split.arms.is_empty() {
        return Err(at.expected(
            "split.arms",
            "at least one arm (`{ weight, lane?, version?, services?, name? }`)",
            Some("none".into()),
        ));
    }
    let (weights, stains) = arms(at, "split.arms", &split.arms, names)?;
    let mut ids: Vec<Box<[u8]>> = Vec::with_capacity(split.arms.len());
    for (i, arm) in split.arms.iter().enumerate() {
        let id = match &arm.name {
            Some(name) => {
                let field = format!("split.arms[{i}].name");
                non_empty(at, &field, name, "an arm name")?;
                name.clone()
            }
            None => i.to_string(),
        };
        if ids.iter().any(|other| **other == *id.as_bytes()) {
            return Err(at.expected(
                format!("split.arms[{i}].name"),
                "a name that no other arm has (an arm without a name is named by its position)",
                Some(format!("{id:?}")),
            ));
        }
        ids.push(id.into_bytes().into());
    }
    let compiled = split
        .arms
        .iter()
        .zip(ids)
        .zip(stains)
        .filter(|((arm, _), _)| arm.weight > 0)
        .map(|((arm, id), stain)| StickyArm {
            id,
            weight: arm.weight,
            stain,
        })
        .collect();
    if weights == 0 {
        return Err(zero_weights(at, "split.arms"));
    }
    Ok(Split::Sticky {
        key,
        salt: split.salt.as_bytes().into(),
        arms: compiled,
    })
}

fn random(
    at: &At<'_>,
    arms_config: &[SplitArmConfig],
    names: &mut Names,
) -> Result<Split, RulesError> {
    let (total, stains) = arms(at, "split", arms_config, names)?;
    if total == 0 {
        return Err(zero_weights(at, "split"));
    }
    let mut upper = 0;
    let arms = arms_config
        .iter()
        .zip(stains)
        .map(|(arm, stain)| {
            // No overflow: the total fits.
            upper += arm.weight;
            (upper, stain)
        })
        .collect();
    Ok(Split::Random { arms, total })
}

/// The total weight of `arms` (written at `field`) and the stain of each.
fn arms(
    at: &At<'_>,
    field: &str,
    arms: &[SplitArmConfig],
    names: &mut Names,
) -> Result<(u32, Vec<Stain>), RulesError> {
    let mut total: u32 = 0;
    let mut stains = Vec::with_capacity(arms.len());
    for (i, arm) in arms.iter().enumerate() {
        let prefix = format!("{field}[{i}].");
        total = total.checked_add(arm.weight).ok_or_else(|| {
            at.expected(
                format!("{prefix}weight"),
                "weights that add up to less than 2^32",
                None,
            )
        })?;
        stains.push(fixed_stain(
            at,
            &prefix,
            arm.lane.as_deref(),
            arm.version.as_deref(),
            &arm.services,
            names,
        )?);
    }
    Ok((total, stains))
}

fn zero_weights(at: &At<'_>, field: &str) -> RulesError {
    at.expected(
        field,
        "at least one arm with a weight above 0",
        Some("all weights 0".into()),
    )
}
