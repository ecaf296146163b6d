//! The API's routes: the table every request is matched against, what
//! each route needs of its caller, and the segments a path takes.

use super::*;

/// What a route needs of its caller when `auth.enabled` is on
/// (docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Nothing: health and metrics.
    Open,
    /// Any authenticated user.
    Anyone,
    /// The action's grant on the route's topic.
    Topic(Action),
    /// Either action's grant on the route's topic (looking at a topic's
    /// rates: its admins and its consumers).
    TopicEither(Action, Action),
    /// The `cluster` grant.
    Cluster,
    /// The user the route names, or the `cluster` grant.
    SelfOrCluster,
}

/// Every route of the API. The router's table ([`ROUTES`]), `dispatch`
/// (which matches it exhaustively, so a route without a handler does not
/// compile), the grant sweep test and the OpenAPI coverage test share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteId {
    Healthz,
    Readyz,
    Metrics,
    OpenApi,
    Cluster,
    ClusterNodes,
    ClusterNode,
    Decommission,
    Rebalance,
    Moves,
    Topics,
    Topic,
    Produce,
    Search,
    ProduceBatch,
    Consume,
    Browse,
    Ack,
    AckBatch,
    Nack,
    NackBatch,
    Extend,
    ExtendBatch,
    Rates,
    Children,
    Child,
    Redrive,
    RedriveTask,
    Schemas,
    Schema,
    Users,
    User,
    UserTokens,
    UserToken,
    UserGrants,
}

impl RouteId {
    /// The metrics' `route` label.
    pub const fn label(self) -> &'static str {
        match self {
            Self::Healthz => "healthz",
            Self::Readyz => "readyz",
            Self::Metrics => "metrics",
            Self::OpenApi => "openapi",
            Self::Cluster => "cluster",
            Self::ClusterNodes => "cluster_nodes",
            Self::ClusterNode => "cluster_node",
            Self::Decommission => "decommission",
            Self::Rebalance => "rebalance",
            Self::Moves => "moves",
            Self::Topics => "topics",
            Self::Topic => "topic",
            Self::Produce => "produce",
            Self::Search => "search",
            Self::ProduceBatch => "produce_batch",
            Self::Consume => "consume",
            Self::Browse => "browse",
            Self::Ack => "ack",
            Self::AckBatch => "ack_batch",
            Self::Nack => "nack",
            Self::NackBatch => "nack_batch",
            Self::Extend => "extend",
            Self::ExtendBatch => "extend_batch",
            Self::Rates => "rates",
            Self::Children => "children",
            Self::Child => "child",
            Self::Redrive => "redrive",
            Self::RedriveTask => "redrive_task",
            Self::Schemas => "schemas",
            Self::Schema => "schema",
            Self::Users => "users",
            Self::User => "user",
            Self::UserTokens => "user_tokens",
            Self::UserToken => "user_token",
            Self::UserGrants => "user_grants",
        }
    }

    /// The settle kind and whether it is a batch, for the settle routes.
    const fn settle(self) -> Option<(SettleKind, bool)> {
        Some(match self {
            Self::Ack => (SettleKind::Ack, false),
            Self::AckBatch => (SettleKind::Ack, true),
            Self::Nack => (SettleKind::Nack, false),
            Self::NackBatch => (SettleKind::Nack, true),
            Self::Extend => (SettleKind::Extend, false),
            Self::ExtendBatch => (SettleKind::Extend, true),
            _ => return None,
        })
    }
}

/// One route: which it is, its path with `{name}` for a segment it takes,
/// and its methods with what each needs.
#[derive(Debug)]
pub struct RouteSpec {
    pub id: RouteId,
    pub path: &'static str,
    pub methods: &'static [(Method, Need)],
}

impl RouteSpec {
    /// The metrics' `route` label.
    pub const fn label(&self) -> &'static str {
        self.id.label()
    }
}

pub(super) const fn spec(
    id: RouteId,
    path: &'static str,
    methods: &'static [(Method, Need)],
) -> RouteSpec {
    RouteSpec { id, path, methods }
}

/// Every route of this build: the router matches paths against these and
/// nothing else, so a route is in this list or does not exist.
pub const ROUTES: &[RouteSpec] = &[
    spec(RouteId::Healthz, "/healthz", &[(Method::GET, Need::Open)]),
    spec(RouteId::Readyz, "/readyz", &[(Method::GET, Need::Open)]),
    spec(RouteId::Metrics, "/metrics", &[(Method::GET, Need::Open)]),
    spec(
        RouteId::OpenApi,
        "/v1/openapi.json",
        &[(Method::GET, Need::Open)],
    ),
    spec(
        RouteId::Cluster,
        "/v1/cluster",
        &[(Method::GET, Need::Anyone)],
    ),
    spec(
        RouteId::ClusterNodes,
        "/v1/cluster/nodes",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        RouteId::ClusterNode,
        "/v1/cluster/nodes/{node}",
        &[(Method::DELETE, Need::Cluster)],
    ),
    spec(
        RouteId::Decommission,
        "/v1/cluster/nodes/{node}/decommission",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        RouteId::Rebalance,
        "/v1/cluster/rebalance",
        &[(Method::POST, Need::Cluster)],
    ),
    spec(
        RouteId::Moves,
        "/v1/cluster/moves",
        &[(Method::GET, Need::Anyone), (Method::POST, Need::Cluster)],
    ),
    spec(
        RouteId::Topics,
        "/v1/topics",
        &[(Method::GET, Need::Anyone)],
    ),
    spec(
        RouteId::Topic,
        "/v1/topics/{topic}",
        &[
            (Method::GET, Need::Topic(Action::Admin)),
            (Method::PUT, Need::Topic(Action::Admin)),
            (Method::DELETE, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        RouteId::Produce,
        "/v1/topics/{topic}/messages",
        &[(Method::POST, Need::Topic(Action::Produce))],
    ),
    spec(
        RouteId::Search,
        "/v1/topics/{topic}/messages",
        &[(Method::GET, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::ProduceBatch,
        "/v1/topics/{topic}/messages/batch",
        &[(Method::POST, Need::Topic(Action::Produce))],
    ),
    spec(
        RouteId::Consume,
        "/v1/topics/{topic}/consume",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::Browse,
        "/v1/topics/{topic}/partitions/{partition}/messages",
        &[(Method::GET, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::Ack,
        "/v1/topics/{topic}/ack",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::AckBatch,
        "/v1/topics/{topic}/ack/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::Nack,
        "/v1/topics/{topic}/nack",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::NackBatch,
        "/v1/topics/{topic}/nack/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::Extend,
        "/v1/topics/{topic}/extend",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::ExtendBatch,
        "/v1/topics/{topic}/extend/batch",
        &[(Method::POST, Need::Topic(Action::Consume))],
    ),
    spec(
        RouteId::Rates,
        "/v1/topics/{topic}/rates",
        &[(
            Method::GET,
            Need::TopicEither(Action::Consume, Action::Admin),
        )],
    ),
    spec(
        RouteId::Children,
        "/v1/topics/{topic}/children",
        &[(Method::GET, Need::Topic(Action::Admin))],
    ),
    spec(
        RouteId::Child,
        "/v1/topics/{topic}/children/{child}",
        &[
            (Method::PUT, Need::Topic(Action::Admin)),
            (Method::DELETE, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        RouteId::Redrive,
        "/v1/topics/{topic}/redrive",
        &[
            (Method::POST, Need::Topic(Action::Admin)),
            (Method::GET, Need::Topic(Action::Admin)),
        ],
    ),
    spec(
        RouteId::RedriveTask,
        "/v1/topics/{topic}/redrive/{task}",
        &[(Method::DELETE, Need::Topic(Action::Admin))],
    ),
    spec(
        RouteId::Schemas,
        "/v1/schemas",
        &[(Method::GET, Need::Anyone)],
    ),
    spec(
        RouteId::Schema,
        "/v1/schemas/{schema}",
        &[
            (Method::GET, Need::Anyone),
            (Method::PUT, Need::Cluster),
            (Method::DELETE, Need::Cluster),
        ],
    ),
    spec(RouteId::Users, "/v1/users", &[(Method::GET, Need::Cluster)]),
    spec(
        RouteId::User,
        "/v1/users/{user}",
        &[
            (Method::PUT, Need::Cluster),
            (Method::DELETE, Need::Cluster),
        ],
    ),
    spec(
        RouteId::UserTokens,
        "/v1/users/{user}/tokens",
        &[(Method::POST, Need::SelfOrCluster)],
    ),
    spec(
        RouteId::UserToken,
        "/v1/users/{user}/tokens/{token}",
        &[(Method::DELETE, Need::SelfOrCluster)],
    ),
    spec(
        RouteId::UserGrants,
        "/v1/users/{user}/grants",
        &[(Method::GET, Need::Cluster), (Method::PUT, Need::Cluster)],
    ),
];

/// A request's route: its spec and the segments it took.
#[derive(Debug, Clone, Copy)]
pub(super) struct Route<'a> {
    pub(super) spec: &'static RouteSpec,
    pub(super) topic: Option<&'a str>,
    pub(super) child: Option<&'a str>,
    pub(super) task: Option<&'a str>,
    pub(super) schema: Option<&'a str>,
    pub(super) user: Option<&'a str>,
    pub(super) token: Option<&'a str>,
    pub(super) node: Option<&'a str>,
    pub(super) partition: Option<&'a str>,
}

impl<'a> Route<'a> {
    /// What this route needs for `method`, if the route takes it.
    pub(super) fn need(&self, method: &Method) -> Option<Need> {
        self.spec
            .methods
            .iter()
            .find(|(m, _)| m == method)
            .map(|(_, need)| *need)
    }

    /// The methods this route's path takes (over every route of the path).
    pub(super) fn allowed(&self) -> Vec<&'static str> {
        self.siblings()
            .flat_map(|spec| spec.methods.iter().map(|(m, _)| m.as_str()))
            .collect()
    }

    /// The routes of the table with this route's path (this one among
    /// them): a path may have a route per method.
    fn siblings(&self) -> impl Iterator<Item = &'static RouteSpec> + '_ {
        ROUTES.iter().filter(|spec| spec.path == self.spec.path)
    }

    /// The route of this path that takes `method`, with the same segments;
    /// this one when none does (the request is then 405).
    pub(super) fn for_method(self, method: &Method) -> Self {
        let takes = |spec: &RouteSpec| spec.methods.iter().any(|(m, _)| m == method);
        match self.siblings().find(|spec| takes(spec)) {
            Some(spec) => Self { spec, ..self },
            None => self,
        }
    }

    /// The settle kind and whether it is a batch, for the settle routes.
    pub(super) fn settle(&self) -> Option<(SettleKind, bool)> {
        self.spec.id.settle()
    }

    /// A segment of this route's path: present whenever the route matched,
    /// since [`ROUTES`] gives the route a path with it (a unit test holds
    /// every handler's segments to its path); a table that lost one
    /// answers 500 naming it.
    pub(super) fn segment(&self, value: Option<&'a str>, name: &str) -> Result<&'a str, ApiError> {
        value.ok_or_else(|| self.broken(&format!("{{{name}}} segment")))
    }

    pub(super) fn broken(&self, what: &str) -> ApiError {
        ApiError::new(
            ErrorCode::Internal,
            format!("route {} has no {what}", self.spec.label()),
        )
    }

    pub(super) fn topic(&self) -> Result<&'a str, ApiError> {
        self.segment(self.topic, "topic")
    }

    pub(super) fn child(&self) -> Result<&'a str, ApiError> {
        self.segment(self.child, "child")
    }

    pub(super) fn task(&self) -> Result<&'a str, ApiError> {
        self.segment(self.task, "task")
    }

    pub(super) fn schema(&self) -> Result<&'a str, ApiError> {
        self.segment(self.schema, "schema")
    }

    pub(super) fn user(&self) -> Result<&'a str, ApiError> {
        self.segment(self.user, "user")
    }

    pub(super) fn token(&self) -> Result<&'a str, ApiError> {
        self.segment(self.token, "token")
    }

    pub(super) fn node(&self) -> Result<&'a str, ApiError> {
        self.segment(self.node, "node")
    }

    /// The `{partition}` segment as a partition number: 400 when it is not
    /// one (whether the topic has it is the handler's to say).
    pub(super) fn partition(&self) -> Result<u32, ApiError> {
        let text = self.segment(self.partition, "partition")?;
        text.parse().map_err(|_| {
            ApiError::new(
                ErrorCode::InvalidRequest,
                format!("partition must be a whole number, got {text:?}"),
            )
        })
    }
}

pub(super) fn route(path: &str) -> Option<Route<'_>> {
    let path = path.trim_start_matches('/');
    let count = path.split('/').count();
    ROUTES.iter().find_map(|spec| {
        let pattern = spec.path.trim_start_matches('/');
        if pattern.split('/').count() != count {
            return None;
        }
        let mut route = Route {
            spec,
            topic: None,
            child: None,
            task: None,
            schema: None,
            user: None,
            token: None,
            node: None,
            partition: None,
        };
        for (want, got) in pattern.split('/').zip(path.split('/')) {
            match want {
                "{topic}" => route.topic = Some(got),
                "{child}" => route.child = Some(got),
                "{task}" => route.task = Some(got),
                "{schema}" => route.schema = Some(got),
                "{user}" => route.user = Some(got),
                "{token}" => route.token = Some(got),
                "{node}" => route.node = Some(got),
                "{partition}" => route.partition = Some(got),
                literal if literal == got => {}
                _ => return None,
            }
        }
        Some(route)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_the_api() {
        let label = |path: &str| route(path).map(|r| r.spec.label());
        assert_eq!(label("/v1/topics"), Some("topics"));
        assert_eq!(
            route("/v1/topics/orders").and_then(|r| r.topic),
            Some("orders")
        );
        assert_eq!(
            label("/v1/topics/orders/messages/batch"),
            Some("produce_batch")
        );
        let nack = route("/v1/topics/orders/nack").expect("nack");
        assert_eq!(nack.settle(), Some((SettleKind::Nack, false)));
        let extend = route("/v1/topics/orders/extend/batch").expect("extend");
        assert_eq!(extend.settle(), Some((SettleKind::Extend, true)));
        assert_eq!(route("/v1/topics/orders").and_then(|r| r.settle()), None);
        let child = route("/v1/topics/orders/children/audit").expect("child");
        assert_eq!(
            (child.spec.id, child.topic, child.child),
            (RouteId::Child, Some("orders"), Some("audit"))
        );
        // One path, a route per method: a method neither takes is 405
        // with both methods allowed.
        let messages = route("/v1/topics/orders/messages").expect("messages");
        assert_eq!(messages.for_method(&Method::GET).spec.id, RouteId::Search);
        assert_eq!(messages.for_method(&Method::POST).spec.id, RouteId::Produce);
        let put = messages.for_method(&Method::PUT);
        assert_eq!(put.need(&Method::PUT), None);
        assert_eq!(put.allowed(), vec!["POST", "GET"]);
        assert_eq!(put.for_method(&Method::GET).topic, Some("orders"));
        assert_eq!(label("/v1/nothing"), None);
        assert_eq!(label("/healthz"), Some("healthz"));
        let token = route("/v1/users/ann/tokens/abc").expect("token");
        assert_eq!((token.user, token.token), (Some("ann"), Some("abc")));
        assert_eq!(
            route("/v1/schemas/order").and_then(|r| r.schema),
            Some("order")
        );
    }

    #[test]
    fn every_route_has_one_label_and_only_health_metrics_and_the_api_document_are_open() {
        let mut labels = std::collections::HashSet::new();
        let mut ids = std::collections::HashSet::new();
        for spec in ROUTES {
            assert!(ids.insert(spec.id), "{:?} twice", spec.id);
            assert!(labels.insert(spec.label()), "{} twice", spec.label());
            let open = spec.methods.iter().any(|(_, need)| *need == Need::Open);
            assert_eq!(
                open,
                matches!(
                    spec.id,
                    RouteId::Healthz | RouteId::Readyz | RouteId::Metrics | RouteId::OpenApi
                ),
                "{}",
                spec.label()
            );
        }
    }

    /// Every segment a handler reads is in its route's path, and the path
    /// matches its own route: what `Route::segment` relies on.
    #[test]
    fn every_route_takes_the_segments_its_handler_reads() {
        for spec in ROUTES {
            let path = spec
                .path
                .split('/')
                .map(
                    |part| match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                        Some(name) => format!("x-{name}"),
                        None => part.to_string(),
                    },
                )
                .collect::<Vec<_>>()
                .join("/");
            let method = &spec.methods[0].0;
            let matched = route(&path)
                .expect("a route's own path matches")
                .for_method(method);
            assert_eq!(matched.spec.id, spec.id, "{path}");
            let reads: &[&str] = match spec.id {
                RouteId::Topic
                | RouteId::Produce
                | RouteId::Search
                | RouteId::Rates
                | RouteId::ProduceBatch
                | RouteId::Consume
                | RouteId::Children
                | RouteId::Redrive => &["topic"],
                id if id.settle().is_some() => &["topic"],
                RouteId::Child => &["topic", "child"],
                RouteId::Browse => &["topic", "partition"],
                RouteId::RedriveTask => &["topic", "task"],
                RouteId::Schema => &["schema"],
                RouteId::User | RouteId::UserTokens | RouteId::UserGrants => &["user"],
                RouteId::UserToken => &["user", "token"],
                RouteId::ClusterNode | RouteId::Decommission => &["node"],
                _ => &[],
            };
            for name in reads {
                let got = match *name {
                    "topic" => matched.topic().ok(),
                    "child" => matched.child().ok(),
                    "task" => matched.task().ok(),
                    "schema" => matched.schema().ok(),
                    "user" => matched.user().ok(),
                    "token" => matched.token().ok(),
                    // A number once parsed: its text is what the path gave.
                    "partition" => matched.partition,
                    _ => matched.node().ok(),
                };
                assert_eq!(
                    got,
                    Some(format!("x-{name}").as_str()),
                    "{path}: {{{name}}}"
                );
            }
        }
    }
}
