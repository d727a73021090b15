//! [`ActorOptions`] and the one conversion from a resource dictionary into them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::resources::{CPU, GPU, MEMORY, OBJECT_STORE_MEMORY};
use crate::{ByteSize, ResourceAmount, ResourceError, Resources};

/// What text renderings print for a value that is absent (`None`) or an empty dictionary.
const NOTHING: &str = "-";

/// The options a worker actor is started with, split out of its resource dictionary.
///
/// `CPU`, `GPU`, `memory` and `object_store_memory` are dedicated options (as Ray's
/// `num_cpus`, `num_gpus`, `memory`, `object_store_memory`); every other resource goes to
/// `resources`, which never holds a reserved name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActorOptions {
    /// CPUs (`CPU`), zero when absent.
    pub num_cpus: ResourceAmount,
    /// GPUs (`GPU`), zero when absent; may be fractional up to 1.
    pub num_gpus: ResourceAmount,
    /// Memory in bytes (`memory`), zero when absent.
    pub memory: u64,
    /// Object store memory in bytes (`object_store_memory`), `None` when absent.
    pub object_store_memory: Option<u64>,
    /// Custom resources: every other key, including `accelerator_type:*`.
    pub resources: Resources,
}

impl TryFrom<&Resources> for ActorOptions {
    type Error = ResourceError;

    /// The conversion from a worker's resource dictionary to its actor options, in one place.
    ///
    /// ```
    /// use trainyard_resources::{ActorOptions, Resources};
    ///
    /// let dict: Resources = r#"{"memory": 10000}"#.parse()?;
    /// let options = ActorOptions::try_from(&dict)?;
    /// assert_eq!(options.memory, 10_000);
    /// assert!(options.num_cpus.is_zero());
    /// assert!(options.resources.is_empty());
    /// # Ok::<(), trainyard_resources::ResourceError>(())
    /// ```
    fn try_from(dict: &Resources) -> Result<Self, Self::Error> {
        dict.validate()?;
        let bytes = |name: &str| -> Result<Option<u64>, ResourceError> {
            dict.get(name)
                .map(|amount| {
                    amount
                        .as_whole_u64()
                        .ok_or_else(|| ResourceError::FractionalBytes {
                            name: name.to_owned(),
                            value: amount,
                        })
                })
                .transpose()
        };
        let mut resources = dict.clone();
        resources.retain(|name, _| !crate::is_reserved(name));
        Ok(Self {
            num_cpus: dict.amount(CPU),
            num_gpus: dict.amount(GPU),
            memory: bytes(MEMORY)?.unwrap_or(0),
            object_store_memory: bytes(OBJECT_STORE_MEMORY)?,
            resources,
        })
    }
}

impl fmt::Display for ActorOptions {
    /// One line of `name=value` pairs, as `trainyard plan` prints it:
    /// `num_cpus=1 num_gpus=0 memory=10GB object_store_memory=- resources=custom=2`.
    ///
    /// Byte sizes carry units (as [`ByteSize`]'s `{:#}`), custom resources are
    /// [`Resources`]' `{:#}`. The text mirrors the JSON form: the numbers `num_cpus`,
    /// `num_gpus` and `memory` are always printed, `0` included (zero is what the actor is
    /// started with, as in JSON); `-` stands for nothing — an absent `object_store_memory`
    /// (JSON `null`) and an empty `resources` (JSON `{}`).
    ///
    /// ```
    /// use trainyard_resources::{ActorOptions, Resources};
    ///
    /// let dict: Resources = "CPU=1,memory=10GB".parse()?;
    /// assert_eq!(
    ///     ActorOptions::try_from(&dict)?.to_string(),
    ///     "num_cpus=1 num_gpus=0 memory=10GB object_store_memory=- resources=-"
    /// );
    /// let dict: Resources = "GPU=0.5,object_store_memory=512MiB,custom=2".parse()?;
    /// assert_eq!(
    ///     ActorOptions::try_from(&dict)?.to_string(),
    ///     "num_cpus=0 num_gpus=0.5 memory=0 object_store_memory=512MiB resources=custom=2"
    /// );
    /// # Ok::<(), trainyard_resources::ResourceError>(())
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "num_cpus={} num_gpus={} memory={:#} object_store_memory=",
            self.num_cpus,
            self.num_gpus,
            ByteSize::new(self.memory),
        )?;
        match self.object_store_memory {
            Some(bytes) => write!(f, "{:#}", ByteSize::new(bytes))?,
            None => f.write_str(NOTHING)?,
        }
        if self.resources.is_empty() {
            write!(f, " resources={NOTHING}")
        } else {
            write!(f, " resources={:#}", self.resources)
        }
    }
}

impl From<&ActorOptions> for Resources {
    /// The resource demand of an actor: the inverse of the conversion, without zero entries.
    fn from(options: &ActorOptions) -> Self {
        let mut out = options.resources.clone();
        out.insert(CPU, options.num_cpus);
        out.insert(GPU, options.num_gpus);
        out.insert(MEMORY, ResourceAmount::from_units(options.memory));
        if let Some(bytes) = options.object_store_memory {
            out.insert(OBJECT_STORE_MEMORY, ResourceAmount::from_units(bytes));
        }
        out.without_zeros()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(text: &str) -> ActorOptions {
        ActorOptions::try_from(&text.parse::<Resources>().unwrap()).unwrap()
    }

    #[test]
    fn missing_cpu_gpu_and_memory_are_zero() {
        let o = options("custom=1");
        assert!(o.num_cpus.is_zero() && o.num_gpus.is_zero());
        assert_eq!(o.memory, 0);
        assert_eq!(o.object_store_memory, None);
        assert_eq!(o.resources, "custom=1".parse().unwrap());
    }

    #[test]
    fn memory_is_passed_as_actor_option_not_custom_resource() {
        let o = options(r#"{"GPU": 1, "memory": 1, "custom": 0.1}"#);
        assert_eq!(o.num_gpus, ResourceAmount::ONE);
        assert_eq!(o.memory, 1);
        assert_eq!(o.resources, "custom=0.1".parse().unwrap());
    }

    #[test]
    fn object_store_memory_is_an_actor_option_too() {
        let o = options("object_store_memory=1GB,accelerator_type:A100=0.001");
        assert_eq!(o.object_store_memory, Some(1_000_000_000));
        assert_eq!(o.resources, "accelerator_type:A100=0.001".parse().unwrap());
    }

    #[test]
    fn conversion_validates_the_dictionary() {
        let dict = Resources::new().with(GPU, "2.5".parse::<ResourceAmount>().unwrap());
        assert!(matches!(
            ActorOptions::try_from(&dict),
            Err(ResourceError::FractionalAccelerator { .. })
        ));
        let dict = Resources::new().with(MEMORY, "0.5".parse::<ResourceAmount>().unwrap());
        assert!(matches!(
            ActorOptions::try_from(&dict),
            Err(ResourceError::FractionalBytes { .. })
        ));
    }

    #[test]
    fn options_serialise_with_integer_bytes_and_null_object_store() {
        let json = serde_json::to_value(options(r#"{"memory": 10000}"#)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"num_cpus": 0, "num_gpus": 0, "memory": 10000, "object_store_memory": null, "resources": {}})
        );
    }

    #[test]
    fn display_prints_numbers_as_numbers_and_dash_for_nothing() {
        assert_eq!(
            options("custom=1").to_string(),
            "num_cpus=0 num_gpus=0 memory=0 object_store_memory=- resources=custom=1"
        );
        assert_eq!(
            options(
                "CPU=2,GPU=1,memory=1536MiB,object_store_memory=1GB,accelerator_type:A100=0.001,b=3"
            )
            .to_string(),
            "num_cpus=2 num_gpus=1 memory=1536MiB object_store_memory=1GB resources=accelerator_type:A100=0.001,b=3"
        );
        assert_eq!(
            ActorOptions::default().to_string(),
            "num_cpus=0 num_gpus=0 memory=0 object_store_memory=- resources=-"
        );
    }

    #[test]
    fn demand_inverts_the_conversion() {
        let dict: Resources = "CPU=2,GPU=0.5,memory=10,custom=3".parse().unwrap();
        assert_eq!(
            Resources::from(&ActorOptions::try_from(&dict).unwrap()),
            dict
        );
    }
}
