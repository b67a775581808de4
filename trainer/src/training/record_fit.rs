//! Whether a checkpoint's records fit the run, checked before Burn sees them.
//!
//! Burn loads a record of another model variant, another shape or another optimizer by
//! panicking or with a multi-line error. So each record is first read as a tree of names and
//! shapes ([`Node`]: MessagePack with every byte string reduced to its length) and compared
//! with what the run itself would write: the freshly initialised model's record for
//! `model.mpk`, and the state this run's optimizer keeps for one parameter for `optim.mpk`.
//! Nothing here knows a model or an optimizer; a mismatch is one line naming the field.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A MessagePack value with byte strings (tensor contents) reduced to their length.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    /// `nil` (a unit, `None`, a constant Burn does not store).
    Nil,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i128),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// A byte string of this many bytes.
    Bytes(usize),
    /// An array.
    Seq(Vec<Node>),
    /// A map with string keys, in the file's order.
    Map(Vec<(String, Node)>),
}

impl Node {
    /// Reads a record written by Burn's named MessagePack recorders.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        // rmp-serde bounds the nesting depth, so a hostile file cannot exhaust the stack.
        rmp_serde::from_slice(bytes).map_err(|e| format!("not a record: {e}"))
    }

    /// The value under `key`, for a map.
    pub fn get(&self, key: &str) -> Option<&Node> {
        match self {
            Self::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    fn keys(&self) -> BTreeSet<&str> {
        match self {
            Self::Map(entries) => entries.iter().map(|(k, _)| k.as_str()).collect(),
            _ => BTreeSet::new(),
        }
    }

    /// Bytes of tensor contents in this record.
    pub fn tensor_bytes(&self) -> usize {
        match self {
            Self::Map(_) if self.is_tensor() => self.tensor().map_or(0, |(_, bytes, _)| bytes),
            Self::Map(entries) => entries.iter().map(|(_, v)| v.tensor_bytes()).sum(),
            Self::Seq(items) => items.iter().map(Self::tensor_bytes).sum(),
            _ => 0,
        }
    }

    /// A tensor's data: `{bytes, shape, dtype}`.
    fn is_tensor(&self) -> bool {
        self.keys() == BTreeSet::from(["bytes", "dtype", "shape"])
    }

    /// A parameter: `{id, param}`.
    fn is_param(&self) -> bool {
        self.keys() == BTreeSet::from(["id", "param"])
    }

    /// The single key of an enum variant's map (`{"Simple": …}`, `{"Rank2": …}`).
    fn variant(&self) -> Option<&str> {
        match self {
            Self::Map(entries) if entries.len() == 1 => {
                let key = entries[0].0.as_str();
                key.starts_with(|c: char| c.is_ascii_uppercase())
                    .then_some(key)
            }
            _ => None,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            Self::Nil => "nothing",
            Self::Bool(_) => "a boolean",
            Self::Int(_) => "an integer",
            Self::Float(_) => "a float",
            Self::Str(_) => "a string",
            Self::Bytes(_) => "bytes",
            Self::Seq(_) => "a list",
            Self::Map(_) if self.is_tensor() => "a tensor",
            Self::Map(_) => "a record",
        }
    }

    /// A tensor's shape, bytes and dtype (as the file spells it).
    fn tensor(&self) -> Option<(Vec<i128>, usize, String)> {
        let shape = match self.get("shape")? {
            Self::Seq(dims) => dims
                .iter()
                .map(|d| match d {
                    Self::Int(n) => Some(*n),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
            _ => return None,
        };
        let bytes = match self.get("bytes")? {
            Self::Bytes(n) => *n,
            _ => return None,
        };
        Some((shape, bytes, self.get("dtype")?.to_string()))
    }
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Str(s) => write!(f, "{s}"),
            Self::Map(entries) => {
                let inner: Vec<String> = entries.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                write!(f, "{{{}}}", inner.join(", "))
            }
            Self::Int(n) => write!(f, "{n}"),
            other => write!(f, "{}", other.kind()),
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = Node;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a MessagePack value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Node, E> {
        Ok(Node::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Node, E> {
        Ok(Node::Int(v.into()))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Node, E> {
        Ok(Node::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Node, E> {
        Ok(Node::Str(v.to_string()))
    }
    fn visit_bytes<E>(self, v: &[u8]) -> Result<Node, E> {
        Ok(Node::Bytes(v.len()))
    }
    fn visit_unit<E>(self) -> Result<Node, E> {
        Ok(Node::Nil)
    }
    fn visit_none<E>(self) -> Result<Node, E> {
        Ok(Node::Nil)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Node, D::Error> {
        Node::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
        // No capacity from the file's declared length: it may lie.
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Node::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
        let mut entries = Vec::new();
        while let Some((key, value)) = map.next_entry::<String, Node>()? {
            entries.push((key, value));
        }
        Ok(Node::Map(entries))
    }
}

/// A parameter of a checked model record: its dotted name and shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ParamInfo {
    /// `conv1.weight`, `blocks.3.bn.gamma`.
    pub name: String,
    /// Its dimensions.
    pub shape: Vec<i128>,
    /// Its place in the record: messages name the first misfit in the model's order.
    pub index: usize,
}

/// The parameters of a record, by id.
pub type Params = BTreeMap<String, ParamInfo>;

/// Checks that `actual` (a `model.mpk`) has the variants, names, shapes and dtypes of
/// `expected` (this run's freshly initialised model, written by the same recorder); returns
/// its parameters by id. Ids must be Burn's and distinct.
pub fn fit_model(expected: &Node, actual: &Node) -> Result<Params, String> {
    let (expected, actual) = (item(expected)?, item(actual)?);
    let mut params = Params::new();
    let mut walk = Walk {
        path: Vec::new(),
        params: &mut params,
    };
    walk.model(expected, actual)?;
    Ok(params)
}

/// A record's content (Burn wraps it as `{metadata, item}`; the metadata names the recorder
/// and is not compared).
fn item(record: &Node) -> Result<&Node, String> {
    record
        .get("item")
        .ok_or_else(|| "not a Burn record (no item)".to_string())
}

struct Walk<'a> {
    path: Vec<String>,
    params: &'a mut Params,
}

impl Walk<'_> {
    fn name(&self) -> String {
        self.path.join(".")
    }

    /// `{name} ` for messages, or nothing at the record's root.
    fn at(&self) -> String {
        match self.path.is_empty() {
            true => "the record".into(),
            false => self.name(),
        }
    }

    fn model(&mut self, expected: &Node, actual: &Node) -> Result<(), String> {
        if expected.is_param() && actual.is_param() {
            return self.param(expected, actual);
        }
        if expected.is_tensor() {
            return self.tensor(expected, actual, "this model's");
        }
        match (expected, actual) {
            (Node::Map(_), Node::Map(_)) => {
                if let (Some(e), Some(a)) = (expected.variant(), actual.variant()) {
                    if e != a {
                        return Err(format!(
                            "{} is a {a} where this run's is a {e}",
                            match self.path.is_empty() {
                                true => "the model".into(),
                                false => self.name(),
                            }
                        ));
                    }
                    // Variant names are not part of a parameter's name.
                    return self.model(&one(expected), &one(actual));
                }
                self.same_keys(expected, actual, "this model")?;
                for (key, e) in entries(expected) {
                    self.path.push(key.clone());
                    self.model(e, actual.get(key).expect("same keys"))?;
                    self.path.pop();
                }
                Ok(())
            }
            (Node::Seq(e), Node::Seq(a)) => {
                if e.len() != a.len() {
                    return Err(format!(
                        "{} has {} entries where this model's has {}",
                        self.at(),
                        a.len(),
                        e.len()
                    ));
                }
                for (i, (e, a)) in e.iter().zip(a).enumerate() {
                    self.path.push(i.to_string());
                    self.model(e, a)?;
                    self.path.pop();
                }
                Ok(())
            }
            (e, a) if std::mem::discriminant(e) == std::mem::discriminant(a) => Ok(()),
            (e, a) => Err(format!(
                "{} is {} where this model has {}",
                self.at(),
                a.kind(),
                e.kind()
            )),
        }
    }

    fn same_keys(&self, expected: &Node, actual: &Node, whose: &str) -> Result<(), String> {
        let (e, a) = (expected.keys(), actual.keys());
        let at = |key: &str| match self.path.is_empty() {
            true => key.to_string(),
            false => format!("{}.{key}", self.name()),
        };
        if let Some(key) = e.difference(&a).next() {
            return Err(format!("{} is missing", at(key)));
        }
        if let Some(key) = a.difference(&e).next() {
            return Err(format!("{} is not part of {whose}", at(key)));
        }
        Ok(())
    }

    fn param(&mut self, expected: &Node, actual: &Node) -> Result<(), String> {
        let name = self.name();
        let id = match actual.get("id") {
            Some(Node::Str(id)) if valid_id(id) => id.clone(),
            _ => return Err(format!("parameter {name} has no valid id")),
        };
        let (e, a) = (
            expected.get("param").expect("a param"),
            actual.get("param").expect("a param"),
        );
        self.tensor(e, a, "this model's")?;
        let (shape, _, _) = a.tensor().expect("checked");
        let index = self.params.len();
        if let Some(other) = self.params.insert(id, ParamInfo { name, shape, index }) {
            return Err(format!(
                "parameters {} and {} have the same id",
                other.name,
                self.name()
            ));
        }
        Ok(())
    }

    /// Compares two tensors: the same shape and dtype, and the bytes those take.
    fn tensor(&self, expected: &Node, actual: &Node, whose: &str) -> Result<(), String> {
        let name = format!("parameter {}", self.name());
        let (e_shape, e_bytes, e_dtype) = expected.tensor().expect("a written tensor");
        let Some((a_shape, a_bytes, a_dtype)) = actual.tensor() else {
            return Err(format!(
                "{name} is {} where {whose} is a tensor",
                actual.kind()
            ));
        };
        if a_shape != e_shape {
            return Err(format!(
                "{name} has shape {a_shape:?} where {whose} is {e_shape:?}"
            ));
        }
        if a_dtype != e_dtype {
            return Err(format!(
                "{name} has dtype {a_dtype} where {whose} is {e_dtype}"
            ));
        }
        if a_bytes != e_bytes {
            return Err(format!(
                "{name} holds {a_bytes} bytes where its shape and dtype take {e_bytes}"
            ));
        }
        Ok(())
    }
}

fn entries(node: &Node) -> &[(String, Node)] {
    match node {
        Node::Map(entries) => entries,
        _ => &[],
    }
}

/// The value of a single-key map.
fn one(node: &Node) -> Node {
    entries(node)[0].1.clone()
}

/// Whether `id` is a parameter id as Burn writes it (13 base32 characters, 0-9 and a-v): Burn
/// panics on any other when it loads the record.
pub fn valid_id(id: &str) -> bool {
    id.len() == 13
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'v').contains(&b))
        && burn::module::ParamId::try_deserialize(id).is_some_and(|p| p.serialize() == id)
}

/// Checks `actual` (an `optim.mpk`) against `template`: the record this run's optimizer
/// (`optimizer`) writes after one step of one parameter of shape `[1]`. Every entry
/// must belong to a parameter of `params` and have that parameter's rank and shape.
pub fn fit_optim(
    template: &Node,
    actual: &Node,
    params: &Params,
    optimizer: &str,
) -> Result<(), String> {
    // The template is a whole record with one entry: that entry is one parameter's state.
    let template = match item(template)? {
        Node::Map(entries) if entries.len() == 1 => &entries[0].1,
        _ => return Err("the optimizer's own state has no single entry".into()),
    };
    let state = match item(actual)? {
        Node::Map(entries) => entries,
        other => {
            return Err(format!(
                "the state is {} where it is a record",
                other.kind()
            ))
        }
    };
    // The record is a hash map (its order differs from run to run): check in the model's.
    let mut entries = Vec::with_capacity(state.len());
    for (id, entry) in state {
        let Some(param) = params.get(id) else {
            return Err(format!(
                "holds state for parameter id {id:?}, which is not a parameter of model.mpk"
            ));
        };
        entries.push((param, entry));
    }
    entries.sort_by_key(|(param, _)| param.index);
    for (param, entry) in entries {
        let mut check = State {
            path: Vec::new(),
            param,
            optimizer,
        };
        check.walk(template, entry).map_err(|e| {
            format!(
                "the state of parameter {} is not {optimizer}'s: {e}",
                param.name
            )
        })?;
    }
    Ok(())
}

/// One parameter's optimizer state against the template.
struct State<'a> {
    path: Vec<String>,
    param: &'a ParamInfo,
    optimizer: &'a str,
}

impl State<'_> {
    fn at(&self, key: &str) -> String {
        self.path
            .iter()
            .map(String::as_str)
            .chain([key])
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join(".")
    }

    fn walk(&mut self, template: &Node, actual: &Node) -> Result<(), String> {
        if template.is_tensor() {
            return self.tensor(template, actual);
        }
        match (template, actual) {
            (Node::Map(_), Node::Map(_)) => {
                if let (Some(t), Some(a)) = (template.variant(), actual.variant()) {
                    if t == "Rank1" {
                        // Burn's adaptor stores each parameter's state under `Rank{D}`.
                        let rank = self.param.shape.len();
                        if a != format!("Rank{rank}") {
                            return Err(format!(
                                "it is kept as {a} where the parameter has rank {rank}"
                            ));
                        }
                    } else if t != a {
                        return Err(format!("it is a {a} where {} keeps a {t}", self.optimizer));
                    }
                    // Variant names (`V1`, `Rank2`) are not part of a field's name.
                    return self.walk(&one(template), &one(actual));
                }
                let (e, a) = (template.keys(), actual.keys());
                if e != a {
                    let list = |keys: BTreeSet<&str>| {
                        let named: Vec<String> = keys.iter().map(|k| self.at(k)).collect();
                        named.join(", ")
                    };
                    return Err(format!(
                        "it holds {} where {} keeps {}",
                        list(a),
                        self.optimizer,
                        list(e)
                    ));
                }
                for (key, t) in entries(template) {
                    self.path.push(key.clone());
                    self.walk(t, actual.get(key).expect("same keys"))?;
                    self.path.pop();
                }
                Ok(())
            }
            (t, a) if std::mem::discriminant(t) == std::mem::discriminant(a) => Ok(()),
            (t, a) => Err(format!(
                "{} is {} where it is {}",
                self.at(""),
                a.kind(),
                t.kind()
            )),
        }
    }

    /// A state tensor has its parameter's shape, the template's dtype and the bytes those take.
    fn tensor(&self, template: &Node, actual: &Node) -> Result<(), String> {
        let name = self.at("");
        let (_, t_bytes, t_dtype) = template.tensor().expect("a written tensor");
        let Some((shape, bytes, dtype)) = actual.tensor() else {
            return Err(format!("{name} is {} where it is a tensor", actual.kind()));
        };
        if shape != self.param.shape {
            return Err(format!(
                "{name} has shape {shape:?} where the parameter's is {:?}",
                self.param.shape
            ));
        }
        if dtype != t_dtype {
            return Err(format!("{name} has dtype {dtype} where it is {t_dtype}"));
        }
        // The template's tensor has one element.
        let numel: i128 = shape.iter().product();
        if i128::try_from(bytes).ok() != numel.checked_mul(t_bytes as i128) {
            return Err(format!(
                "{name} holds {bytes} bytes, not what its shape and dtype take"
            ));
        }
        Ok(())
    }
}
